"""The placement summary printed after every run: where the nodes ran, how long, what moved."""

from __future__ import annotations

from ..viz.record import human_bytes
from .table import Row


def placement_rows(session) -> tuple[list[str], list[Row]]:
    """Per device: nodes and fragments in the prefill and decode plans, programs compiled, time (its runs,
    the wait for their results and its transfers), bytes copied in. An emulation says so under its row."""
    by_phase = {}
    for plan, _ in session.plans.values():
        by_phase.setdefault(plan.graph.meta.get("phase"), plan)
    stats = session.executor.stats
    rows = []
    for dev in session.devices:
        use = {ph: plan.per_device().get(dev.name, {"nodes": 0, "fragments": 0}) for ph, plan in by_phase.items()}
        if not any(u["nodes"] for u in use.values()):
            continue
        st = stats.get(dev.name, {})
        rows.append(Row([dev.name, _pair(use, "nodes"), _pair(use, "fragments"), str(st.get("compiles", 0)),
                         f"{st.get('seconds', 0.0):.2f} s", human_bytes(st.get("bytes_copied", 0))],
                        f"EMULATION of {dev.emulation}" if dev.emulation else "", "yellow" if dev.emulation else ""))
    return ["device", "nodes pre/dec", "fragments pre/dec", "programs", "time", "copied in"], rows


def _pair(use: dict, key: str) -> str:
    """'815 / 815': the prefill's and the decode's count ('-' for a phase that did not run)."""
    return " / ".join(str(use[ph][key]) if ph in use else "-" for ph in ("prefill", "decode"))


def fallback_lines(session) -> list[str]:
    """One line per op, device and reason codes over every plan that ran (--strict lists every node)."""
    from ..core.scheduler.fallbacks import group_fallbacks
    return [g.line() for g in group_fallbacks(plan for plan, _ in session.plans.values())]
