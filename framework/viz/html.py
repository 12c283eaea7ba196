"""The interactive view: one self-contained HTML file (inline CSS and JavaScript, the plan as JSON,
no network, no external script or font)."""

from __future__ import annotations

import html
import json

from ..core.scheduler.fallbacks import group_fallbacks
from .assets import PAGE
from .dot import colours
from .record import UNPLACED, PlanView, estimated_cost, layer_of, leaf_records


def view_data(view: PlanView) -> dict:
    """Everything the page needs, as one JSON-able dict."""
    fill = colours(view.lanes)
    by_name = {d.name: d for p in view.plans.values() for d in p.devices}
    by_name.update({d.name: d for d in view.devices})
    lanes = []
    for name in view.lanes:
        d = by_name.get(name)
        kind = "nodes no device accepts" if name == UNPLACED else (d.type.value if d is not None else "")
        lanes.append({"name": name, "type": kind, "colour": fill[name],
                      "emulation": getattr(d, "emulation", None) or None,
                      "description": getattr(d, "description", "") or ""})
    budgets = view.budgets()           # measures every plan's memory too (Plan.memory), for a failed one as well
    phases = []
    for phase, plan in view.plans.items():
        rec = plan.to_dict()
        for f, x in zip(rec["fragments"], view.fragment_extras(phase)):
            f.update(x)
        nodes = plan.graph.nodes
        phases.append({
            "name": phase, "meta": rec["graph"], "nodes": rec["nodes"], "fragments": rec["fragments"],
            "copies": rec["copies"], "per_device": rec["per_device"], "programs": rec["programs"],
            "fallbacks": rec["fallbacks"], "marks": view.error_marks(plan), "leaves": leaf_records(plan, view),
            "memory": rec["memory"], "fit_lines": plan.fit.lines() if plan.fit is not None else [],
            "fallback_groups": [{"op": g.op, "device": g.device, "count": g.count, "first": g.first,
                                 "reasons": {d: str(v) for d, v in g.reasons.items()}}
                                for g in group_fallbacks([plan])],
            "cost": [estimated_cost(n) for n in nodes],
            "layer": [-1 if (layer := layer_of(n.name)) is None else layer for n in nodes],
            "bytes": [n.nbytes for n in nodes],
        })
    error = None
    if view.error is not None:
        error = view.error.to_dict()
    names = ", ".join(d.name for d in view.devices)
    return {"title": f"{view.model.rsplit('/', 1)[-1]} on {names}", "model": view.model, "lanes": lanes,
            "budgets": budgets, "device_seconds": view.device_seconds, "error": error,
            "notes": view.notes, "phases": phases, "measured": bool(view.measured)}


def render_html(view: PlanView) -> str:
    data = view_data(view)
    # JSON inside <script>: "<" never appears raw, so no "</script>" or "<!--" can end it early
    blob = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    return PAGE.replace("__TITLE__", html.escape("plan: " + data["title"])).replace("__DATA__", blob)
