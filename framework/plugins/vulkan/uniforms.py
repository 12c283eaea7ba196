"""The steps' parameter blocks: one uniform buffer per program, a block per step UNIFORM_STRIDE bytes
apart: the element offsets of the step's tensor bindings, then the kernel's own parameters. Written
once, and again only when an argument arrives at another offset or a weight's scale plane moved."""

from __future__ import annotations

import numpy as np

from ...backend import ChunkArg, Ref, RopeArg, Step

UNIFORM_STRIDE = 256      # bytes between two steps' parameter blocks (wgpu's uniform offset alignment)
BLOCK_BYTES = UNIFORM_STRIDE   # bytes a kernel's block may take (wgsl.BLOCK_WORDS words)


class ParamBlocks:
    def __init__(self, dev, steps: list[Step]):
        import wgpu
        n = max(1, len(steps))
        self.words = np.zeros((n, UNIFORM_STRIDE // 4), dtype=np.uint32)
        self.dyn: list[tuple[int, int, int, int]] = []    # (step, word, arg, static offset)
        self.moffs: list[tuple[int, int, int, int]] = []  # (step, word, arg, chunk)
        self.ropes: list[tuple[int, int, int]] = []       # (step, word, rope table)
        for si, st in enumerate(steps):
            for bi, b in enumerate(st.binds):
                if isinstance(b, Ref):
                    self.words[si, bi] = b.off
                    if b.kind == "arg":
                        self.dyn.append((si, bi, b.idx, b.off))
                elif isinstance(b, RopeArg):
                    self.ropes.append((si, bi, b.table))
            for w, typ, v in st.kernel.words:
                if isinstance(v, ChunkArg):
                    self.moffs.append((si, w, v.arg, v.chunk))
                elif typ == "f32":
                    self.words[si, w] = np.float32(v).view(np.uint32)
                else:
                    self.words[si, w] = _u32(st.name, w, v)
        self.buffer = dev.new_buffer(self.words.nbytes, wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self.key = None

    def update(self, queue, offs: list[int], weights: dict, wkey, rope_offs) -> None:
        """Rewrite the blocks when an argument's offset differs from the last run, or a rope table's (in its
        (cos, sin) pairs), or a weight is another (its scale planes may lie elsewhere; wkey changes with the
        weight handles); decode, step after step, writes nothing."""
        key = (tuple(offs), wkey, tuple(rope_offs))
        if key == self.key:
            return
        for si, w, a, off in self.dyn:
            self.words[si, w] = off + offs[a]
        for si, w, ti in self.ropes:
            self.words[si, w] = rope_offs[ti]
        for si, w, a, c in self.moffs:
            self.words[si, w] = weights[a].chunks[c].moff
        queue.write_buffer(self.buffer, 0, self.words)
        self.key = key

    def entry(self, si: int) -> dict:
        """Binding 0 of step si's bind group."""
        return {"binding": 0, "resource": {"buffer": self.buffer, "offset": si * UNIFORM_STRIDE, "size": BLOCK_BYTES}}


def _u32(step: str, word: int, v) -> int:
    if v != int(v) or not 0 <= int(v) < 1 << 32:
        raise ValueError(f"{step}: parameter word {word} is {v!r}, not a u32")
    return int(v)
