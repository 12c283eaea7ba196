"""Where a program's computed values live: a fragment's outputs get buffers of their own each run (from
the device's pool, returned when the handles are gone); every other value takes a scratch slot, shared
by every program of the device (runs are sequential on the queue and no internal value outlives its
run), a slot reused once the last reader of its value has run."""

from __future__ import annotations

from dataclasses import dataclass

from .steps import Ref, Step


@dataclass
class Memory:
    val_out: list[int]      # per value: its index among the outputs with buffers of their own, or -1
    n_out: int
    val_slot: list[int]     # per value: its scratch slot, or -1
    slot_bytes: list[int]   # per scratch slot: the bytes it needs


def _outputs(val_out: list[int], outputs: list[Ref]) -> int:
    n_out = 0
    for r in outputs:
        if r.kind == "val" and val_out[r.idx] < 0:
            val_out[r.idx] = n_out
            n_out += 1
    return n_out


def _deaths(steps: list[Step], nv: int) -> dict[int, list[int]]:
    """Per step: the values whose last reader (or writer) it is."""
    last = [-1] * nv
    for si, st in enumerate(steps):
        for v in (*st.reads, *st.writes):
            last[v] = max(last[v], si)
    dies: dict[int, list[int]] = {}
    for u in range(nv):
        dies.setdefault(last[u], []).append(u)
    return dies


def assign(steps: list[Step], val_sizes: list[int], outputs: list[Ref]) -> Memory:
    """Outputs first, then scratch slots in step order: a value takes the smallest free slot that holds
    it, else the largest free one (grown), else a new one; its slot is free again after its last reader."""
    nv = len(val_sizes)
    val_out = [-1] * nv
    n_out = _outputs(val_out, outputs)
    dies = _deaths(steps, nv)
    val_slot = [-1] * nv
    sizes: list[int] = []
    free: list[int] = []
    for si, st in enumerate(steps):
        for v in st.writes:
            if val_out[v] >= 0 or val_slot[v] >= 0:
                continue
            need = val_sizes[v]
            best = min((s for s in free if sizes[s] >= need), key=lambda s: sizes[s], default=None)
            if best is None and free:
                best = max(free, key=lambda s: sizes[s])
            if best is None:
                sizes.append(need)
                best = len(sizes) - 1
            else:
                free.remove(best)
                sizes[best] = max(sizes[best], need)
            val_slot[v] = best
        for u in dies.get(si, ()):
            if val_slot[u] >= 0 and val_out[u] < 0:
                free.append(val_slot[u])
    return Memory(val_out, n_out, val_slot, [4 * s for s in sizes])
