"""The placement summary printed after every run: where the nodes ran, how long, what moved."""

from __future__ import annotations

from rich.table import Table

from ..viz.record import human_bytes


def placement_table(session) -> Table:
    """Per device: nodes and fragments in the prefill and decode plans, programs compiled, time, bytes copied."""
    by_phase = {}
    for plan, _ in session.plans.values():
        by_phase.setdefault(plan.graph.meta.get("phase"), plan)
    stats = session.executor.stats
    table = Table(title="placement", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("device", "nodes pre/dec", "fragments pre/dec", "programs",
                "time", "copied in"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for dev in session.devices:
        use = {ph: plan.per_device().get(dev.name, {"nodes": 0, "fragments": 0}) for ph, plan in by_phase.items()}
        if not any(u["nodes"] for u in use.values()):
            continue
        label = dev.name + (f" [yellow](EMULATION of {dev.emulation})[/yellow]" if dev.emulation else "")
        pair = lambda key: " / ".join(str(use[ph][key]) if ph in use else "-" for ph in ("prefill", "decode"))
        st = stats.get(dev.name, {})
        table.add_row(label, pair("nodes"), pair("fragments"), str(st.get("compiles", 0)),
                      f"{st.get('seconds', 0.0):.2f} s", human_bytes(st.get("bytes_copied", 0)))
    return table


def fallback_lines(session) -> list[str]:
    seen, lines = set(), []
    for plan, _ in session.plans.values():
        for node, placement in plan.fallbacks:
            key = (node.op, placement.device, tuple(placement.refusals.items()))
            if key in seen:
                continue
            seen.add(key)
            why = "; ".join(f"{d}: {r}" for d, r in placement.refusals.items())
            lines.append(f"fallback: {node.op} nodes (first: {node.name}) ran on {placement.device} ({why})")
    return lines

