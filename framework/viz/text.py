"""The terminal summary: one line per fragment, in the spirit of GGML_SCHED_DEBUG but readable.

    #12  cpu        2 nodes  [215-216] Qcur_rope-6 .. Kcur_rope-6
         in: Qcur_normed-6 40.0 KiB, Kcur_normed-6 10.0 KiB from example:0 | fallback 2 (ROPE)
"""

from __future__ import annotations

from ..core.scheduler.fallbacks import count, group_fallbacks
from .record import UNPLACED, PlanView, human_bytes

ARROW = "<-- ERROR"


def _limit(used: int, limit: int | None, fmt=str) -> str:
    return f"{fmt(used)} of {fmt(limit) if limit is not None else 'no limit'}"


def _shared_here(view: PlanView, plan) -> str:
    """The target's tensors a draft plan reads or writes, by where they are held."""
    if plan.graph.meta.get("role") != "draft":
        return ""
    by_home: dict[tuple, list[str]] = {}
    for t in plan.graph.leaves:
        if view.is_shared(t, plan):
            home = view.residence[id(t)]
            by_home.setdefault((home.device, home.buffer.name), []).append(t.name)
    parts = []
    for (dev, buf), names in sorted(by_home.items(), key=lambda kv: not kv[1][0].startswith("cache_")):
        caches = [n for n in names if n.startswith("cache_")]
        weights = len(names) - len(caches)
        what = ", ".join(caches) + (f"{', ' if caches else ''}{weights} weight{'s' if weights > 1 else ''}"
                                    if weights else "")
        parts.append(f"{what} (buffer '{buf}' on {dev})")
    return "; ".join(parts)


def render_text(view: PlanView) -> str:
    lines: list[str] = []
    names = ", ".join(d.name + (f" (EMULATION of {d.emulation})" if d.emulation else "") for d in view.devices)
    lines.append(f"plan of {view.model} on {names}")
    e = view.error
    if e is not None:
        lines.append("")
        lines.append(f"RESERVATION FAILED: {str(e).splitlines()[0]}")
        for extra in str(e).splitlines()[1:]:
            lines.append(f"  {extra.strip()}")
        where = [f"{k} {getattr(e, k)}" for k in ("node", "tensor", "limit") if getattr(e, k)]
        if e.devices:
            where.append("devices " + ", ".join(e.devices))
        lines.append("  at: " + ("; ".join(where) if where else "(the error names no node, tensor or device)"))
        lines.append(f"  the lines marked {ARROW} below are where it is")
    lines.append("")
    lines.append(f"budgets over every phase ({', '.join(view.all_plans)}):")
    for dev, b in view.budgets().items():
        mem = b["memory"]
        flag = ""
        if view.error_budget and dev in e.devices:
            flag = f"   {ARROW} [{e.code}] {view.error_budget}"
        lines.append(f"  {dev:<12} live programs {_limit(b['programs'], b['max_live_programs'])}; longest chain "
                     f"{_limit(b['chain'], b['max_chain'])} commands; memory "
                     f"{_limit(mem['total'], b['memory_bytes'], human_bytes)}"
                     + (f", {b['memory_source']}" if b.get("memory_source") else "")
                     + f" (weights {human_bytes(mem['weights'])}, "
                     f"caches {human_bytes(mem['caches'])}, activations {human_bytes(mem['activations'])}"
                     + (f", programs {human_bytes(mem['programs'])}" if mem.get("programs") else "") + ")"
                     + (f"; measured {view.device_seconds[dev]:.3f} s" if dev in view.device_seconds else "") + flag)
    for phase in view.plans:
        lines.append("")
        lines += _phase_lines(view, phase)
    lines += [f"note: {n}" for n in view.notes]
    return "\n".join(lines) + "\n"


def _phase_lines(view: PlanView, phase: str) -> list[str]:
    plan = view.plans[phase]
    extras = view.fragment_extras(phase)
    marks = view.error_marks(plan)
    marked = set(marks.get("fragments", ()))
    total = sum(c.nbytes for c in plan.copies)
    lines = [(f"{phase}: {count(len(plan.graph.nodes), 'node')}, {count(len(plan.fragments), 'fragment')}, "
              f"{count(len(plan.copies), 'copy', 'copies')} ({human_bytes(total)}), "
              f"{count(len(plan.fallbacks), 'fallback')}")]
    width = max(len(d) for d in [*view.lanes, "device"])
    for f, x in zip(plan.fragments, extras):
        end = x["start"] + len(f.nodes) - 1
        time = (f"  {x['seconds'] * 1000:.2f} ms in {x['runs']} run{'s' if x['runs'] != 1 else ''}"
                if "seconds" in x else "")
        names = f.nodes[0].name if len(f.nodes) == 1 else f"{f.nodes[0].name} .. {f.nodes[-1].name}"
        head = (f"  #{f.index:<3} {f.device:<{width}} {len(f.nodes):>4} node{'s' if len(f.nodes) > 1 else ' '} "
                f"[{x['start']}-{end}] {names}{time}")
        if f.index in marked:
            named = [n for n in marks["nodes"] if any(m.name == n for m in f.nodes)]
            head += f"   {ARROW} [{view.error.code}] at {', '.join(named[:3])}" + (" ..." if len(named) > 3 else "")
        lines.append(head)
        detail = []
        if x["copies_in"]:
            groups: dict[str, list[str]] = {}
            for c in x["copies_in"]:
                groups.setdefault(c["from"], []).append(f"{c['tensor']} {human_bytes(c['bytes'])}")
            detail.append("in: " + "; ".join(f"{', '.join(v)} from {src}" for src, v in groups.items()))
        if x["fallbacks"]:
            ops = sorted({n.op for n in f.nodes if plan.placement[id(n)].refusals})
            memory = all(plan.placement[id(n)].memory for n in f.nodes if plan.placement[id(n)].refusals)
            detail.append(f"fallback{' for memory' if memory else ''} {x['fallbacks']} ({', '.join(ops)})"
                          if f.device != UNPLACED
                          else f"no device accepts {x['fallbacks']} ({', '.join(ops)})")
        if detail:
            lines.append(f"  {'':<4} {'':<{width}} " + " | ".join(detail))
    shared = _shared_here(view, plan)
    if shared:
        lines.append(f"  shared with the target, in place: {shared}")
    budgets = view.budgets()
    lines.append("  per device: " + "; ".join(
        f"{dev} {count(u['nodes'], 'node')}, {count(u['fragments'], 'fragment')}, "
        f"{count(u['submissions'], 'submission')}, {count(u['programs'], 'program')}, memory "
        f"{_limit(plan.memory.get(dev, {}).get('total', 0), budgets.get(dev, {}).get('memory_bytes'), human_bytes)}"
        for dev, u in plan.per_device().items()))
    lines += [f"  {g.line(planned=not view.measured)}" for g in group_fallbacks([plan])]
    if plan.fit is not None:
        lines += [f"  {line}" for line in plan.fit.lines()]
    return lines
