"""The placement summary printed after every run: where the nodes ran, how long, what moved."""

from __future__ import annotations

from ..viz.record import human_bytes
from ..terminal import Row


def placement_rows(session) -> tuple[list[str], list[Row]]:
    """Per device: nodes and fragments in the prefill and decode plans, programs compiled, time (its runs,
    the wait for their results and its transfers), bytes copied in, and the memory it holds in each phase
    against its budget. An emulation says so under its row."""
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
        notes = [f"EMULATION of {dev.emulation}"] if dev.emulation else []
        notes += _figures(dev.run_figures(), session.prefill.tokens + session.decode.tokens)
        rows.append(Row([dev.name, _pair(use, "nodes"), _pair(use, "fragments"), str(st.get("compiles", 0)),
                         f"{st.get('seconds', 0.0):.2f} s", human_bytes(st.get("bytes_copied", 0)),
                         _memory(by_phase, dev.name)], "; ".join(notes), "yellow" if dev.emulation else ""))
    return ["device", "nodes pre/dec", "fragments pre/dec", "programs", "time", "copied in", "memory pre/dec"], rows


def _figures(figures: dict, tokens: int) -> list[str]:
    """What a device measured itself (Device.run_figures): a remote device's network bytes per token (prefill
    and decode together) and the time its node computed."""
    out = []
    if "network_bytes" in figures:
        per = figures["network_bytes"] / tokens if tokens else 0
        out.append(f"{human_bytes(per)}/token over the network")
        if figures.get("weight_network_bytes"):
            out.append(f"weights sent once: {human_bytes(figures['weight_network_bytes'])}")
    if "node_seconds" in figures:
        out.append(f"{figures['node_seconds']:.2f} s computed on its node")
    return out


def _memory(by_phase: dict, device: str) -> str:
    """'42.6 / 38.0 of 60.0 MiB': what the device holds in the prefill and the decode plan, of its budget."""
    used = " / ".join(f"{by_phase[ph].memory.get(device, {}).get('total', 0) / 2**20:.1f}" if ph in by_phase else "-"
                      for ph in ("prefill", "decode"))
    budget = next((p.budgets[device] for p in by_phase.values() if device in p.budgets), None)
    return f"{used} of {budget.nbytes / 2**20:.1f} MiB" if budget is not None else f"{used} MiB"


def memory_fit_lines(session) -> list[str]:
    """What the memory fit kept on each device, when a device's memory moved layers to the next one."""
    return session.fit.lines()


def _pair(use: dict, key: str) -> str:
    """'815 / 815': the prefill's and the decode's count ('-' for a phase that did not run)."""
    return " / ".join(str(use[ph][key]) if ph in use else "-" for ph in ("prefill", "decode"))


def fallback_lines(session) -> list[str]:
    """One line per op, device and reason codes over every plan that ran (--strict lists every node)."""
    from ..core.scheduler.fallbacks import group_fallbacks
    return [g.line() for g in group_fallbacks(plan for plan, _ in session.plans.values())]
