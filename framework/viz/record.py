"""What every view of a plan shows: the plans, the budgets they use, the error they failed with,
and the time each fragment took when they ran.

A `PlanView` is built from a session (`from_session`): either the reservation succeeded and its
plans are shown, or it raised a `CapabilityError` and the plans that could still be made are shown
with the error marked on the node, tensor or device it names. A node that no device accepts is put
on the pseudo-device `(no device)` so that the rest of the graph can still be planned around it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ..contract import Device, DeviceType, Limits, Verdict
from ..core.graph import VIEW_OPS, LeafKind, Tensor
from ..core.scheduler import CapabilityError, Placement, Plan, Reservation, make_plan
from ..core.scheduler.reserve import check_memory, memory_limits
from ..core.scheduler.verdicts import ask

UNPLACED = "(no device)"
_LAYER = re.compile(r"(?:-(\d+)(?:_|$))|(?:^blk\.(\d+)\.)")


class Unplaced(Device):
    """Stands in, in a failed plan only, for the nodes that no selected device accepts."""

    name = UNPLACED
    type = DeviceType.ACCEL
    description = "the nodes no selected device accepts (a plan that failed reservation)"

    def __init__(self, devices: list[Device]):
        self.real = list(devices)

    def supports_op(self, node: Tensor) -> Verdict:
        if any(ask(d, node).ok for d in self.real):
            return Verdict.no("placed_elsewhere", "a selected device accepts this node")
        return Verdict.yes()

    def supports_buffer(self, buft) -> Verdict:
        return Verdict.yes()

    def compile(self, fragment):
        raise RuntimeError("nothing runs on (no device): it only shows where a plan failed")


def plan_with_unplaced(graph, devices: list[Device], residence: dict, fit=None) -> Plan:
    """make_plan, or when a node fits no device, a plan with such nodes on `(no device)`."""
    try:
        return make_plan(graph, devices, residence, fit)
    except CapabilityError as e:
        if e.code != "no_device_for_node":
            raise
    plan = make_plan(graph, [*devices, Unplaced(devices)], residence, fit)
    for key, p in list(plan.placement.items()):
        if p.device == UNPLACED and p.refusals:
            why = "; ".join(f"{d}: {r}" for d, r in p.refusals.items())
            plan.placement[key] = Placement(UNPLACED, f"no selected device accepts it ({why})", p.refusals)
        elif UNPLACED in p.refusals:
            # the stand-in's "placed_elsewhere" is no refusal: a node a selected device took is no fallback
            plan.placement[key] = replace(p, refusals={d: r for d, r in p.refusals.items()
                                                                    if d != UNPLACED})
    return plan


def layer_of(name: str) -> int | None:
    """The transformer layer a node or weight belongs to, from its name ('Qcur-3', 'blk.3.attn_q.weight')."""
    m = _LAYER.search(name)
    if not m:
        return None
    return int(m.group(1) if m.group(1) is not None else m.group(2))


def estimated_cost(n: Tensor) -> int:
    """A rough count of arithmetic operations: enough to size blocks, not to predict time."""
    if n.op in VIEW_OPS or n.is_leaf:
        return 0
    if n.op == "MUL_MAT":
        return 2 * n.nelements * n.src[0].shape[-1]
    if n.op == "FLASH_ATTN_EXT":
        q, k = n.src[0], n.src[1]
        t, h, d = q.shape[-3:] if len(q.shape) >= 3 else (1, *q.shape[-2:])
        return 4 * t * h * k.shape[0] * d
    if n.op in ("RMS_NORM", "SOFT_MAX", "ROPE", "GLU"):
        return 4 * n.nelements
    return n.nelements


@dataclass
class PlanView:
    model: str
    devices: list[Device]                       # the selected devices, in priority order
    plans: dict[str, Plan]                      # phase name -> plan
    residence: dict = field(default_factory=dict)
    reservation: Reservation | None = None
    error: CapabilityError | None = None
    measured: dict[str, dict[int, dict]] = field(default_factory=dict)   # phase -> fragment -> seconds, runs
    device_seconds: dict[str, float] = field(default_factory=dict)       # measured, per device
    notes: list[str] = field(default_factory=list)
    all_plans: dict[str, Plan] = field(default_factory=dict)            # every phase, for the budgets
    # a draft's tensors that are its target's, used in place: name -> (owner's device, buffer)
    shared: dict[str, tuple[str, str]] = field(default_factory=dict)
    speculative: dict | None = None          # a run's speculative decoding figures (SpecStats.to_dict)

    def is_shared(self, t: Tensor, plan: Plan) -> bool:
        """t, read or written by a draft's plan, is its target's (by identity: names may repeat, as the
        token_embd.weight of an MTP assistant and of its target)."""
        home = self.residence.get(id(t))
        return plan.graph.meta.get("role") == "draft" and home is not None and bool(home.owner)

    def __post_init__(self):
        self.all_plans = self.all_plans or dict(self.plans)

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def from_session(cls, session, n_prompt: int, n_predict: int, phase: str | None = None) -> PlanView:
        """Reserve; on a CapabilityError, plan every shape the run would use anyway and keep the error."""
        from ..runtime.context import phase_name
        model = str(session.model.file.path)
        try:
            reservation = session.reserve(n_prompt, n_predict)
            plans, error = dict(reservation.plans), None
        except CapabilityError as e:
            reservation, error = None, e
            plans = {}
            for key in session.context.shapes_for(n_prompt, n_predict):
                graph = session.context.graph(key)[0]
                plans[phase_name(key)] = plan_with_unplaced(graph, session.devices, session.residence, session.fit)
        view = cls(model=model, devices=list(session.devices), plans=plans, residence=session.residence,
                   reservation=reservation, error=error)
        return view.only_phase(phase)

    @classmethod
    def from_decoder(cls, decoder, n_prompt: int, n_predict: int, phase: str | None = None) -> PlanView:
        """A target and its draft (speculative decoding), reserved together: the target's phases, then the
        draft's ("draft ..."), and the target's tensors the draft uses in place, marked shared. On a
        CapabilityError, every shape of both is planned anyway and the error kept."""
        try:
            reservation = decoder.reserve(n_prompt, n_predict)
            plans, error = dict(reservation.plans), None
        except CapabilityError as e:
            reservation, error = None, e
            plans = {}
            for s, keys in zip(decoder.sessions(), decoder.keys(n_prompt, n_predict)):
                for key in keys:
                    graph = s.context.graph(key)[0]
                    plans[s.context.phase_name(key)] = plan_with_unplaced(graph, s.devices, s.residence)
        view = cls._of_pair(decoder, plans)
        view.reservation, view.error = reservation, error
        return view.only_phase(phase)

    @classmethod
    def _of_pair(cls, decoder, plans: dict[str, Plan]) -> PlanView:
        sessions = decoder.sessions()
        devices = list({d.name: d for s in sessions for d in s.devices}.values())
        view = cls(model=str(decoder.target.model.file.path), devices=devices, plans=plans,
                   residence={k: v for s in sessions for k, v in s.residence.items()})
        for name, plan in plans.items():
            if plan.graph.meta.get("role") != "draft":
                continue
            for t in plan.graph.leaves:
                home = decoder.draft.session.residence.get(id(t))
                if home is not None and home.owner:
                    view.shared[t.name] = (home.device, home.buffer.name)
        view.notes.append(f"draft: {decoder.draft.describe()}; {len(view.shared)} of the target's tensors used in "
                          f"place by it")
        return view

    @classmethod
    def after_run_pair(cls, decoder) -> PlanView:
        """The plans a target and its draft ran, with the time each executor measured."""
        plans = {}
        for s in decoder.sessions():
            plans.update({s.context.phase_name(k): plan for k, (plan, _) in s.plans.items()})
        view = cls._of_pair(decoder, plans)
        view.speculative = decoder.stats.to_dict()
        view.notes.append(decoder.stats.line())
        for s in decoder.sessions():
            for dev, st in s.executor.stats.items():
                view.device_seconds[dev] = view.device_seconds.get(dev, 0.0) + st.get("seconds", 0.0)
            for k, (plan, _) in s.plans.items():
                got = {f.index: dict(s.executor.fragment_stats[(id(plan), f.index)]) for f in plan.fragments
                       if (id(plan), f.index) in s.executor.fragment_stats}
                if got:
                    view.measured[s.context.phase_name(k)] = got
        return view

    @classmethod
    def after_run(cls, session) -> PlanView:
        """The plans a session ran, with the time the executor measured."""
        from ..runtime.context import phase_name
        plans = {phase_name(k): plan for k, (plan, _) in session.plans.items()}
        ex = session.executor
        view = cls(model=str(session.model.file.path), devices=list(session.devices), plans=plans,
                   residence=session.residence,
                   device_seconds={d: s.get("seconds", 0.0) for d, s in ex.stats.items()})
        per_fragment = getattr(ex, "fragment_stats", None)
        if per_fragment is None:
            view.notes.append("time per fragment was not recorded (this executor keeps time per device only)")
        else:
            for phase, plan in plans.items():
                got = {f.index: dict(per_fragment[(id(plan), f.index)]) for f in plan.fragments
                       if (id(plan), f.index) in per_fragment}
                if got:
                    view.measured[phase] = got
        return view

    def only_phase(self, phase: str | None) -> PlanView:
        if phase is None:
            return self
        self.all_plans = self.all_plans or dict(self.plans)
        kept = {name: p for name, p in self.plans.items() if p.graph.meta.get("phase") == phase}
        if not kept:
            raise ValueError(f"no {phase} plan among {', '.join(self.plans)}")
        self.plans = kept
        return self

    # -- derived -------------------------------------------------------------------------------
    @property
    def lanes(self) -> list[str]:
        """Devices with a lane: the selected ones, then (no device) when a plan uses it."""
        names = [d.name for d in self.devices]
        if any(UNPLACED in p.per_device() for p in self.all_plans.values()):
            names.append(UNPLACED)
        return names

    def budgets(self) -> dict[str, dict]:
        """Per device, over every phase of the run (shown or not): programs, longest chain, memory; each
        with its limit, as reservation counts them."""
        by_name = {d.name: d for d in self.devices}
        programs: dict[str, set] = {}
        chain: dict[str, int] = {}
        for plan in self.all_plans.values():
            for f in plan.fragments:
                programs.setdefault(f.device, set()).add(f.program)
                for s, e in f.submissions:
                    count = sum(1 for n in f.nodes[s:e] if n.op not in VIEW_OPS)
                    chain[f.device] = max(chain.get(f.device, 0), count)
        if self.reservation is not None and set(self.reservation.plans) == set(self.all_plans):
            memory = self.reservation.memory
        else:
            memory = _memory_without_limits(self.all_plans, self.devices, self.residence)
        budgets = memory_limits(self.all_plans)
        out = {}
        for name in self.lanes:
            limits = by_name[name].limits if name in by_name else Limits()
            mem = memory.get(name, {"weights": 0, "caches": 0, "activations": 0, "total": 0})
            budget = budgets.get(name)
            out[name] = {"programs": len(programs.get(name, ())), "max_live_programs": limits.max_live_programs,
                         "chain": chain.get(name, 0), "max_chain": limits.max_chain,
                         "memory": mem, "memory_bytes": budget.nbytes if budget else None,
                         "memory_source": budget.source if budget else None}
        return out

    def error_marks(self, plan: Plan) -> dict:
        """Where the error is in one plan: the nodes, the fragments holding them, devices, the budget."""
        e = self.error
        if e is None:
            return {}
        failed = self.all_plans.get(e.phase) if e.phase else None
        if failed is not None and failed.graph.meta.get("role") != plan.graph.meta.get("role"):
            return {}           # a draft's error is not the target's (their node names are alike)
        by_name = {n.name: n for n in plan.graph.nodes}
        touching: list[str] = []         # the nodes that read or write the tensor the error names
        if e.tensor:
            touching = [n.name for n in plan.graph.nodes if n.op not in VIEW_OPS
                        and (n.name == e.tensor or any(s.storage.name == e.tensor for s in n.src))]
        names = [e.node] if e.node in by_name else touching
        frag_of = {id(n): f.index for f in plan.fragments for n in f.nodes}
        return {"nodes": names, "fragments": sorted({frag_of[id(by_name[n])] for n in names}),
                "tensor": e.tensor, "tensor_nodes": [n for n in touching if n not in names],
                "devices": list(e.devices), "budget": self.error_budget}

    @property
    def error_budget(self) -> str | None:
        """The budget the error exceeded: programs, chain or memory (of the devices it names)."""
        if self.error is None or not self.error.limit:
            return None
        return {"max_live_programs": "programs", "memory_bytes": "memory",
                "max_chain": "chain"}.get(self.error.limit.split("=")[0])

    def record(self) -> dict:
        """The plan record (what `framework check --plan` writes), with the reservation or its error."""
        rec = {"model": self.model, "devices": [d.name for d in self.devices],
               "plans": {name: p.to_dict() for name, p in self.plans.items()}}
        if self.reservation is not None:
            rec["reservation"] = {"programs": self.reservation.programs, "memory": self.reservation.memory}
        rec["error"] = self.error.to_dict() if self.error is not None else None
        if self.error is not None:
            rec["error"]["marks"] = {name: self.error_marks(p) for name, p in self.plans.items()}
        if self.measured:
            rec["measured"] = {ph: {str(i): v for i, v in m.items()} for ph, m in self.measured.items()}
        if self.device_seconds:
            rec["device_seconds"] = self.device_seconds
        if self.shared:
            rec["shared"] = {name: {"device": d, "buffer": b} for name, (d, b) in self.shared.items()}
        if self.speculative is not None:
            rec["speculative"] = self.speculative
        return rec

    def fragment_extras(self, phase: str) -> list[dict]:
        """Per fragment: its first node index, estimated cost, copies in (with their source fragment), fallbacks."""
        plan = self.plans[phase]
        index = {id(n): i for i, n in enumerate(plan.graph.nodes)}
        frag_of = {id(n): f.index for f in plan.fragments for n in f.nodes}
        by_tensor = {}
        for c in plan.copies:
            by_tensor.setdefault((c.fragment, c.tensor), c)
        measured = self.measured.get(phase, {})
        out = []
        for f in plan.fragments:
            copies = []
            for t in f.inputs:
                c = by_tensor.get((f.index, t.name))
                if c is not None:
                    copies.append({"tensor": c.tensor, "from": c.src_device, "bytes": c.nbytes,
                                   "fragment": frag_of.get(id(t))})
            rec = {"start": index[id(f.nodes[0])], "cost": sum(estimated_cost(n) for n in f.nodes),
                   "copies_in": copies,
                   "fallbacks": sum(1 for n in f.nodes if plan.placement[id(n)].refusals)}
            if f.index in measured:
                rec["seconds"] = measured[f.index].get("seconds", 0.0)
                rec["runs"] = measured[f.index].get("runs", 0)
            out.append(rec)
        return out


def _memory_without_limits(plans: dict[str, Plan], devices: list[Device], residence: dict) -> dict:
    """What check_memory counts, measured only (a failed plan is shown with what it would need); each plan
    keeps its own phase's figures too."""
    by_name = {d.name: d for p in plans.values() for d in p.devices}
    by_name.update({d.name: d for d in devices})
    return check_memory(plans, by_name, residence, enforce=False)


def leaf_records(plan: Plan, view: PlanView | None = None) -> dict[str, list]:
    """name -> [kind, shape, dtype, bytes] of every leaf the plan reads (weights, inputs, caches); the kind of
    a draft's leaf that is its target's says so."""
    out = {}
    for t in plan.graph.leaves:
        kind = t.kind.value if isinstance(t.kind, LeafKind) else "leaf"
        if view is not None and view.is_shared(t, plan):
            kind += f", the target's, shared in place on {view.residence[id(t)].device}"
        out[t.name] = [kind, list(t.shape), t.dtype.name, t.nbytes]
    return out


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
