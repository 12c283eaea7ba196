"""Reservation: plan every graph shape a run will use and check the plans, before anything is
allocated or compiled. Either a Reservation comes back or a CapabilityError is raised.

Checks, in order:
  1. every pre-allocated tensor is usable in place by every device that reads or writes it;
  2. with strict, no node runs on a device later than the first in the list;
  3. the programs all phases need, with those other sessions of the process hold on the same device,
     fit each device's live-program budget;
  4. commands per submission fit each device's chain limit (plans cut submissions to fit);
  5. weights, caches and activations fit each device's memory (the smallest of what it declares, what
     its plugin reports free and a --device-memory cap); the planner's memory fit has already moved
     the layers that do not fit to the next device, so this names what no device of the list holds.

`check_together` repeats checks 3 and 5 for several reservations that live in one process at once
(a server's models, each with its parallel sessions), counting them all together.

`reserve_together` checks the plans of sessions that share a process (a draft and its target) as one:
each against its own residences, the budgets over all of them.

What checks 1, 2 and 5 find in one plan is kept on it (Plan.checked) with the residence and devices it was
found against: a session checks its kept plans again with every new shape (a server meets new prompt lengths
all the time), and then only the new plan is worked out; the budgets are still checked over all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...contract import Device
from ..graph import VIEW_OPS, Fragment, Graph, LeafKind, Tensor, ops
from .errors import CapabilityError
from .fallbacks import MEMORY, count, group_fallbacks
from .memory import Budget, Fit
from .plan import Plan, Residence, make_plan, preallocated_sources
from .verdicts import ask_buffer


@dataclass
class Reservation:
    plans: dict[str, Plan]                 # phase name -> plan
    programs: dict[str, int]               # device -> distinct programs over all phases
    memory: dict[str, dict[str, int]]      # device -> {"weights", "caches", "activations", "total"}

    def summary(self) -> list[str]:
        lines = []
        limits = memory_limits(self.plans)
        for phase, plan in self.plans.items():
            for dev, use in plan.per_device().items():
                lines.append(f"{phase:>16}  {dev}: {count(use['nodes'], 'node')}, "
                             f"{count(use['fragments'], 'fragment')}, {count(use['submissions'], 'submission')}, "
                             f"{count(use['programs'], 'program')}, memory "
                             f"{memory_against(plan.memory.get(dev, {}).get('total', 0), limits.get(dev))}")
            if plan.copies:
                lines.append(f"{'':>16}  {count(len(plan.copies), 'copy', 'copies')}, "
                             f"{sum(c.nbytes for c in plan.copies) / 2**20:.1f} MiB")
            lines += [f"{'':>16}  {g.line(planned=True)}" for g in group_fallbacks([plan])]
        for dev, n in self.programs.items():
            mem = self.memory.get(dev, {})
            lines.append(f"{dev}: {count(n, 'program')} over all phases, memory "
                         f"{memory_against(mem.get('total', 0), limits.get(dev))} "
                         f"(weights {mem.get('weights', 0) / 2**20:.1f}, caches {mem.get('caches', 0) / 2**20:.1f}, "
                         f"activations {mem.get('activations', 0) / 2**20:.1f}"
                         + (f", compiled programs {mem['programs'] / 2**20:.1f}" if mem.get("programs") else "") + ")")
        fit = next((p.fit for p in self.plans.values() if p.fit is not None), None)
        return lines + (fit.lines() if fit is not None else [])


def memory_against(used: int, budget: Budget | None) -> str:
    """'150.2 MiB of 200.0 MiB (capped)', or '150.2 MiB' where the device has no budget."""
    return f"{_mib(used)} of {budget.text()}" if budget is not None else _mib(used)


def reserve(phases: dict[str, Graph | Plan], devices: list[Device], residence: dict[int, Residence] | None = None,
            strict: bool = False, held: dict[str, int] | None = None, fit: Fit | None = None) -> Reservation:
    """Plan (or re-check, for phases given as plans) every phase, then check the plans together.
    ``held``: programs the caller already holds per device (counted in the plans, not again among
    the device's live programs). ``fit``: the memory fit the new plans follow (make_plan)."""
    residence = residence or {}
    by_name = {d.name: d for d in devices}
    plans = {}
    for phase, graph in phases.items():
        plan = graph if isinstance(graph, Plan) else make_plan(graph, devices, residence, fit)
        _check_plan(phase, plan, residence, by_name, strict)
        plans[phase] = plan
    programs = check_program_budget(plans, by_name, held or {})
    memory = check_memory(plans, by_name, residence)
    return Reservation(plans=plans, programs=programs, memory=memory)


def _check_plan(phase: str, plan: Plan, residence, by_name, strict: bool) -> None:
    """Checks 1 and 2 of one plan, once for a residence, devices and strictness (Plan.checked); the error
    keeps the phase it was found in."""
    against = (residence, strict, *by_name.values())
    if _found(plan, "buffers", against):
        return
    try:
        check_preallocated(plan, residence, by_name)
        if strict:
            check_strict(plan, phase)
    except CapabilityError as e:
        e.phase = phase
        raise
    plan.checked["buffers"] = (against, True)


def _found(plan: Plan, what: str, against: tuple):
    """What reservation found on this plan before, if it was found against these very objects (residence,
    devices: the same objects in one session, so a kept plan's checks are not repeated), else None."""
    kept = plan.checked.get(what)
    if kept is None or len(kept[0]) != len(against) or any(a is not b for a, b in zip(kept[0], against)):
        return None
    return kept[1]


def reserve_together(groups: list[tuple[dict[str, Plan], dict[int, Residence]]], devices: list[Device],
                     strict: bool = False, held: dict[str, int] | None = None) -> Reservation:
    """Re-check the plans of several sessions that run in one process (a target and its draft): each
    group's plans against its own residences (check 1, and 2 with strict), then the programs and memory of
    all of them together (checks 3 to 5), since they share the devices' budgets. Phase names must be
    unique over the groups."""
    by_name = {d.name: d for d in devices}
    plans: dict[str, Plan] = {}
    for phases, residence in groups:
        for phase, plan in phases.items():
            _check_plan(phase, plan, residence, by_name, strict)
            plans[phase] = plan
    residence = {k: v for _, r in groups for k, v in r.items()}
    programs = check_program_budget(plans, by_name, held or {})
    memory = check_memory(plans, by_name, residence)
    return Reservation(plans=plans, programs=programs, memory=memory)


def check_preallocated(plan: Plan, residence: dict[int, Residence], by_name: dict[str, Device]) -> None:
    """1. A device that reads or writes a pre-allocated tensor must use that tensor's buffer in place.
    Caches are checked before the weights another session lends (a draft borrowing its target's), so
    the error names the cache a draft writes."""
    uses = [(n, t) for n in plan.graph.nodes if n.op not in VIEW_OPS for t in preallocated_sources(n, residence)]
    uses.sort(key=lambda use: use[1].kind != LeafKind.CACHE)
    for n, t in uses:
        dev = by_name[plan.device_of(n)]
        home = residence.get(id(t))
        if home is None or home.held_on(dev.name):
            continue
        verdict = ask_buffer(dev, home.buffer, n)
        if not verdict.ok:
            raise _buffer_error(plan, n, t, home, dev, verdict)


def _buffer_error(plan: Plan, n: Tensor, t: Tensor, home: Residence, dev: Device, verdict) -> CapabilityError:
    role = plan.graph.meta.get("role")
    same = (f"; {home.device} and {dev.name} are the same physical device ({dev.physical_id}) reached "
            f"through two plugins" if home.physical_id and home.physical_id == dev.physical_id else "")
    whose = f" ({home.owner}'s, shared with the {role})" if home.owner and role else ""
    of = f" of the {role}" if role else ""
    kind = "pre-allocated tensor" if t.kind == LeafKind.CACHE else "weight"
    if role == "draft":
        fix = (f"place the draft with the target: list {home.device} first in --draft-backends, or keep "
               f"'{t.name}' in a buffer both {home.device} and {dev.name} can use (a draft model file with a "
               f"cache of its own shares nothing)")
    else:
        fix = (f"place the graph that uses '{t.name}' on {home.device} (list it first in --backends), or keep "
               f"'{t.name}' in a buffer both {home.device} and {dev.name} can use")
    return CapabilityError(
        "buffer_not_usable",
        f"{kind} '{t.name}'{whose} is held in buffer '{home.buffer.name}' on device {home.device}, but node "
        f"'{n.name}' ({n.op}){of} that reads or writes it is placed on {dev.name}, which cannot use that buffer "
        f"({verdict.code}: {verdict.reason}){same}",
        tensor=t.name, node=n.name, devices=(home.device, dev.name), limit=f"buffer={home.buffer.name}", fix=fix)


def check_strict(plan: Plan, phase: str) -> None:
    """2. --strict: every node on the first device of the list."""
    fallbacks = plan.fallbacks
    if not fallbacks:
        return
    first = plan.devices[0].name
    # one line per op, device and reasons (a layer's worth of nodes repeats each refusal), with the first node
    groups = group_fallbacks([plan])
    lines = [_strict_line(g, {n.name: n for n, _ in fallbacks}) for g in groups]
    moves = [m for _, p in fallbacks for m in p.memory if m.device == first]
    memory = next((m for m in moves if m.part.startswith("layer")), moves[0] if moves else None)   # the next layer
    fix = f"drop --strict to let them fall back, or use a device that supports them instead of {first}"
    if memory is not None:
        fix = (f"drop --strict to let the layers {first} cannot hold run on the next device, or give {first} more "
               f"memory (it has {_mib(memory.limit)}, {memory.source}; with {memory.part} it would need "
               f"{_mib(memory.needed)})" + (", or lift the cap of --device-memory" if memory.source == "capped"
                                            else ""))
    raise CapabilityError(
        "strict_fallback", f"--strict: {len(fallbacks)} nodes of the {phase} graph would not run on {first}, "
        f"{count(len(groups), 'group')} by op and reason (`framework split` lists every node):\n    "
        + "\n    ".join(lines), node=fallbacks[0][0].name, devices=tuple(d.name for d in plan.devices), fix=fix)


def _strict_line(group, nodes: dict[str, Tensor]) -> str:
    """'24 MUL_MAT nodes -> cpu (first: ffn_up-0, [2304, 1] F32 of [640, 2304] Q4_K, [640, 1] F32; also
    ffn_up-1, ffn_up-2 and 21 more); xdna:0: unsupported_dtype: ...'."""
    n = nodes[group.first]
    operands = ", ".join(f"{list(s.shape)} {s.dtype.name}" for s in n.src)
    others = group.nodes[1:3]
    also = (f"; also {', '.join(others)}" + (f" and {group.count - 3} more" if group.count > 3 else "")
            if others else "")
    what = "node" if group.op == MEMORY else f"{group.op} node"
    return (f"{count(group.count, what)} -> {group.device} (first: {n.name}, {list(n.shape)} {n.dtype.name} of "
            f"{operands}{also}); " + "; ".join(f"{d}: {r}" for d, r in group.reasons.items()))


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
            f"{len(structures)} distinct programs ({detail}){live}{_splitters(plans, dev)}", devices=(dev,),
            limit=f"max_live_programs={budget}",
            fix=(f"close the other sessions on {dev} first (their programs are freed with them), or give this "
                 f"one another device" if others and len(structures) <= budget else
                 f"at most {budget} fit{_layers_that_fit(plans, dev, budget - others)}: let {dev} take whole "
                 f"fragments (remove what splits them, e.g. an op it refuses between layers), or put another "
                 f"device before it in --backends"))
    return {dev: len(s) for dev, s in needed.items()}


def _splitters(plans: dict[str, Plan], dev: str, most: int = 3) -> str:
    """'; its fragments are split by the nodes it refuses: 72 ROPE (refused_by_config), ...': the refusals
    that cut the device's layers into more fragments, hence more programs, the largest groups first."""
    refused: dict[tuple[str, str], set[str]] = {}
    for g in group_fallbacks(plans.values()):
        for device, code in g.codes:
            if device == dev:
                refused.setdefault((g.op, code), set()).update(g.nodes)
    if not refused:
        return ""
    ranked = sorted(refused.items(), key=lambda kv: -len(kv[1]))
    said = ", ".join(f"{len(nodes)} {op} ({code})" for (op, code), nodes in ranked[:most])
    more = f" and {len(ranked) - most} more" if len(ranked) > most else ""
    return f"; its fragments are split by the nodes it refuses: {said}{more}"


def _layers_that_fit(plans: dict[str, Plan], dev: str, room: int) -> str:
    """' (the programs of layers 0-11, 12 of 30 layers)': how many whole layers, from the first, the budget
    left holds, counting the programs outside the layers (the head, the embeddings) first. A fragment counts
    for the first layer it holds (one cut between layers runs from a layer into the next)."""
    per_layer: dict[int | None, set[str]] = {}
    for plan in plans.values():
        for f in plan.fragments:
            if f.device == dev:
                layers = [n.layer for n in f.nodes if n.layer is not None]
                per_layer.setdefault(min(layers, default=None), set()).add(f.program)
    layers = sorted(k for k in per_layer if k is not None)
    if not layers:
        return ""
    held, fit = set(per_layer.get(None, ())), 0
    for layer in layers:
        held |= per_layer[layer]
        if len(held) > room:
            break
        fit += 1
    span = f"layers {layers[0]}-{layers[fit - 1]}, " if fit > 1 else f"layer {layers[0]}, " if fit == 1 else ""
    return f" (the programs of {span}{fit} of {len(layers)} layers)"


@dataclass
class _Use:
    """What one device holds for some plans: weights (id -> tensor and bytes), caches, and the largest
    fragment's activations with the fragment's name."""

    weights: dict[int, tuple[Tensor, int]] = field(default_factory=dict)
    caches: dict[int, Tensor] = field(default_factory=dict)
    activations: tuple[int, str] = (0, "")
    fragments: dict[str, Fragment] = field(default_factory=dict)     # one of each program key

    def add(self, other: "_Use") -> None:
        self.weights.update(other.weights)
        self.caches.update(other.caches)
        self.fragments.update(other.fragments)
        self.activations = max(self.activations, other.activations, key=lambda a: a[0])

    def totals(self, device: Device) -> dict[str, int]:
        use = {"weights": sum(b for _, b in self.weights.values()),
               "caches": sum(t.nbytes for t in self.caches.values()), "activations": self.activations[0],
               "programs": device.programs_nbytes(list(self.fragments.values()))}
        use["total"] = sum(use.values())
        return use


def _plan_memory(plan: Plan, phase: str, by_name: dict[str, Device],
                 residence: dict[int, Residence]) -> dict[str, _Use]:
    """What each device holds for one plan, and the plan's own figures (Plan.memory); worked out once for a
    phase name, residence and devices (Plan.checked)."""
    against = (residence, *by_name.values())
    out = _found(plan, f"memory of {phase}", against)
    if out is None:
        out = _count_plan(plan, phase, by_name, residence)
        plan.memory = {dev: use.totals(by_name[dev]) for dev, use in out.items()}
        plan.checked[f"memory of {phase}"] = (against, out)
    return out


def _count_plan(plan: Plan, phase: str, by_name: dict[str, Device],
                residence: dict[int, Residence]) -> dict[str, _Use]:
    out: dict[str, _Use] = {}
    for f in plan.fragments:
        use = out.setdefault(f.device, _Use())
        for t in f.inputs:
            if t.is_leaf and t.kind == LeafKind.WEIGHT:
                use.weights[id(t)] = (t, by_name[f.device].weight_nbytes(t))
        use.fragments.setdefault(f.program, f)
        live = sum(n.nbytes for n in f.nodes if ops.makes_memory(n.op))
        if live > use.activations[0]:
            use.activations = (live, f"{phase} fragment {f.index}")
    for t in plan.graph.leaves:
        home = residence.get(id(t)) if t.kind == LeafKind.CACHE else None
        if home is not None:
            out.setdefault(home.device, _Use()).caches[id(t)] = t
    return out


def memory_limits(plans: dict[str, Plan]) -> dict[str, Budget]:
    """The smallest budget the plans give each device (a session's plans all carry the same)."""
    out: dict[str, Budget] = {}
    for plan in plans.values():
        for dev, b in plan.budgets.items():
            if dev not in out or b.nbytes < out[dev].nbytes:
                out[dev] = b
    return out


def check_memory(plans: dict[str, Plan], by_name: dict[str, Device], residence: dict[int, Residence],
                 enforce: bool = True) -> dict[str, dict[str, int]]:
    """5. Weights each device loads, caches it holds and its largest fragment's activations, over every
    phase, against its budget (Plan.budgets: declared, reported free, or capped for planning). Each plan
    keeps its own phase's figures (Plan.memory). ``enforce=False`` only measures."""
    total: dict[str, _Use] = {}
    for phase, plan in plans.items():
        for dev, use in _plan_memory(plan, phase, by_name, residence).items():
            total.setdefault(dev, _Use()).add(use)
    limits = memory_limits(plans)
    out = {}
    for name, use in total.items():
        out[name] = use.totals(by_name[name])
        limit = limits.get(name)
        if enforce and limit is not None and out[name]["total"] > limit.nbytes:
            raise _out_of_memory(name, limit, out[name], list(use.weights.values()), list(use.caches.values()),
                                 use.activations[1], [p.fit for p in plans.values() if p.fit is not None],
                                 len(use.fragments))
    return out


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _large(n: float) -> str:
    """ " = 4.2 TiB" for sizes of a GiB or more (a --ctx far too large shows at a glance), else ""."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30)):
        if n >= scale:
            return f" = {n / scale:.1f} {unit}"
    return ""


def _out_of_memory(device: str, budget: Budget, use: dict[str, int], weights: list[tuple[Tensor, int]],
                   caches: list[Tensor], biggest_fragment: str, fits: list[Fit], n_programs: int) -> CapabilityError:
    """The error names what drives the need (the largest weights, the caches and their rows, the
    fragment with the most activations), what the memory fit already moved, and a fix that would make
    the plans fit."""
    limit = budget.nbytes
    largest = sorted(weights, key=lambda tb: -tb[1])[:3]
    parts = [f"weights {_mib(use['weights'])}" + (f" (largest: {', '.join(f'{t.name} {_mib(b)}' for t, b in largest)})"
                                                   if largest else "")]
    rows = max((t.shape[0] for t in caches), default=0)
    if caches:
        parts.append(f"caches {_mib(use['caches'])}{_large(use['caches'])} ({len(caches)} tensors of {rows} rows, e.g. "
                     f"{caches[0].name})")
    parts.append(f"activations {_mib(use['activations'])}" + (f" ({biggest_fragment})" if biggest_fragment else ""))
    if use["programs"]:
        parts.append(f"compiled programs {_mib(use['programs'])} ({n_programs} step fragments' programs, which "
                     f"hold memory of their own)")
    over = use["total"] - limit
    room = limit - use["weights"] - use["activations"] - use["programs"]       # what the caches may take
    if use["programs"] >= over and use["programs"] > use["caches"]:
        fix = (f"plan fewer step shapes on {device}: lower --parallel (a server plans steps of up to --parallel "
               f"rows) or --ctx, or put another device before it in --backends")
    elif caches and use["caches"] >= over and room > 0:
        fit = int(rows * room / use["caches"])
        ctx = fit - fit % 256 if fit >= 256 else fit          # a multiple of the KV padding where it can be
        fix = (f"lower --ctx: the caches take {use['caches'] / rows / 1024:.1f} KiB per row of context, and at most "
               f"{fit} rows fit beside the weights and activations (--ctx {ctx})")
    elif use["activations"] >= over and use["activations"] > 0:
        fix = (f"lower --batch: the largest fragment's activations ({_mib(use['activations'])}) must shrink by "
               f"{_mib(over)}, and they grow with the prefill chunk")
    else:
        fix = (f"the weights alone need {_mib(use['weights'])} of {device}'s {_mib(limit)}: use a device with at least "
               f"{_mib(use['total'])}, or list another device after {device} in --backends (the layers that do not "
               f"fit go on to the next device)")
    moved = next((f.lines() for f in fits if f.moves), [])
    if moved:
        parts.append("the layers the devices before it could not hold went on to it ("
                     + "; ".join(line.removeprefix("memory fit: ") for line in moved) + ")")
    return CapabilityError(
        "out_of_memory", f"device {device} has {budget.text()}, the plans need {_mib(use['total'])}: "
        + "; ".join(parts), devices=(device,), limit=f"memory_bytes={limit}", fix=fix)


def check_together(reservations: dict[str, tuple[Reservation, int]], by_name: dict[str, Device]) -> dict[str, dict]:
    """3 and 5 over several models held by one process at once, each with ``n`` sessions that share its
    weights and programs and own a KV cache each: {model: (reservation, n)}. Programs are counted once per
    model, plus those already live on the device; memory counts weights once, caches n times and the
    largest activations once (the sessions' steps run one at a time), and programs' own memory once per model.
    Returns per device
    {"programs": int, "memory": int}."""
    out: dict[str, dict] = {}
    for name, dev in by_name.items():
        programs = {m: r.programs.get(name, 0) for m, (r, _) in reservations.items()}
        mem = {m: r.memory.get(name, {}) for m, (r, _) in reservations.items()}
        memory = (sum(u.get("weights", 0) + u.get("programs", 0) + n * u.get("caches", 0)
                      for (_, n), u in zip(reservations.values(), mem.values()))
                  + max((u.get("activations", 0) for u in mem.values()), default=0))
        out[name] = {"programs": sum(programs.values()), "memory": memory}
        emu = f" (EMULATION of {dev.emulation})" if dev.emulation else ""
        each = ", ".join(f"{m}: {n}" for m, n in programs.items() if n)
        budget, live = dev.limits.max_live_programs, dev.live_programs()
        if budget is not None and out[name]["programs"] + live > budget:
            raise CapabilityError(
                "program_budget", f"device {name}{emu} allows {budget} live compiled programs, but the models "
                f"served together need {out[name]['programs']} ({each})"
                + (f", and {live} are already live in this process" if live else ""),
                devices=(name,), limit=f"max_live_programs={budget}",
                fix=f"serve fewer models on {name}, or put another device before it in --backends")
        budgets = [b for r, _ in reservations.values() if (b := memory_limits(r.plans).get(name)) is not None]
        budget = min(budgets, key=lambda b: b.nbytes, default=None)
        if budget is not None and memory > budget.nbytes:
            sessions = ", ".join(f"{m}: {n} sessions" for m, (_, n) in reservations.items())
            raise CapabilityError(
                "out_of_memory", f"device {name}{emu} has {budget.text()}, the models served together need "
                f"{_mib(memory)} ({sessions}; weights once per model, a KV cache per session)",
                devices=(name,), limit=f"memory_bytes={budget.nbytes}",
                fix="lower --parallel or --ctx, serve fewer models, or put part of them on another device")
    return out
