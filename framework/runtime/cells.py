"""The cells of one KV cache shared by several sequences (llama.cpp's unified cache).

A cell is one row of the cache's K and V tensors. Each cell holds the K and V of one position and is
used by a set of sequences: those whose context has that token at that position. Sequences that share
a prefix (a copied prompt, a cached one) use the same cells for it; a cell is free once no sequence
uses it. A batch row of sequence s at position p attends to cell c iff s uses c and pos(c) <= p (and,
where the model has a sliding window, p - pos(c) < window).

Why new cells go above a sequence's last one: attention sums the keys in cell order, so a sequence
whose cells ascend with its positions sums them in the order it would alone, and its logits are the
same bits as in a cache of its own (on plugins whose sums run in key order, as the cpu plugin's do).
When the cells above are taken, the lowest free cells are used: correct, though rounded differently.
"""

from __future__ import annotations

import numpy as np

from .context import ContextFullError


class Cells:
    """Each cell's position (-1: free) and which sequences use it, for a cache of n_cells rows."""

    def __init__(self, n_cells: int):
        if n_cells < 1:
            raise ValueError(f"a cache needs at least one cell, got {n_cells}")
        self.n_cells = n_cells
        self.pos = np.full(n_cells, -1, dtype=np.int64)
        self.refs = np.zeros(n_cells, dtype=np.int32)       # how many sequences use each cell
        self.member: dict[int, np.ndarray] = {}              # sequence id -> which cells it uses

    # -- what is there --------------------------------------------------------------------
    @property
    def n_free(self) -> int:
        return int(np.count_nonzero(self.refs == 0))

    def sequences(self) -> list[int]:
        return sorted(self.member)

    def cells_of(self, seq: int) -> np.ndarray:
        """The cells a sequence uses, in cell order."""
        m = self.member.get(seq)
        return np.flatnonzero(m) if m is not None else np.zeros(0, dtype=np.int64)

    def n_past(self, seq: int) -> int:
        """The tokens in the sequence's context: one past its highest position."""
        cells = self.cells_of(seq)
        return int(self.pos[cells].max()) + 1 if cells.size else 0

    def high(self) -> int:
        """One past the highest used cell: the rows a step must attend over."""
        used = np.flatnonzero(self.refs)
        return int(used[-1]) + 1 if used.size else 0

    # -- changing it ----------------------------------------------------------------------
    def allocate(self, seq: int, n: int) -> np.ndarray:
        """Cells for the sequence's next n tokens (positions n_past .. n_past + n - 1), in position order."""
        if n < 1:
            raise ValueError(f"allocate needs at least one token, got {n}")
        start = self.n_past(seq)
        mine = self.cells_of(seq)
        above = int(mine[-1]) + 1 if mine.size else 0
        free = np.flatnonzero(self.refs[above:] == 0) + above
        if free.size < n:
            free = np.flatnonzero(self.refs == 0)
        if free.size < n:
            others = len(self.member) - (seq in self.member)
            raise ContextFullError(f"the KV cache has {free.size} free cells of {self.n_cells} and sequence {seq} "
                                   f"needs {n} more: its {start} tokens and those of {others} other sequences "
                                   f"fill it; raise --ctx, lower --parallel or wait for a sequence to end")
        cells = free[:n]
        self._use(seq, cells)
        self.pos[cells] = np.arange(start, start + n)
        return cells

    def release(self, seq: int, cells: np.ndarray) -> None:
        """Stop the sequence using these cells (a step that failed gives back what it allocated)."""
        m = self.member.get(seq)
        if m is None:
            return
        cells = np.asarray(cells)[m[np.asarray(cells)]]
        m[cells] = False
        self.refs[cells] -= 1
        self.pos[cells[self.refs[cells] == 0]] = -1
        if not m.any():
            del self.member[seq]

    def free(self, seq: int) -> None:
        """Drop a sequence: its cells no other sequence uses become free at once."""
        self.release(seq, self.cells_of(seq))

    def keep(self, seq: int, n_past: int) -> None:
        """Keep the sequence's first n_past tokens (drop later positions: a rewind)."""
        cells = self.cells_of(seq)
        self.release(seq, cells[self.pos[cells] >= n_past])

    def share(self, src: int, dst: int, n_tokens: int) -> None:
        """dst's context becomes src's first n_tokens tokens, on the same cells (nothing is copied)."""
        if src == dst:
            raise ValueError(f"sequence {src} cannot share its cells with itself")
        if n_tokens > self.n_past(src):
            raise ValueError(f"sequence {src} holds {self.n_past(src)} tokens, fewer than the {n_tokens} to share")
        self.free(dst)
        cells = self.cells_of(src)
        cells = cells[self.pos[cells] < n_tokens]
        if cells.size:
            self._use(dst, cells)

    def _use(self, seq: int, cells: np.ndarray) -> None:
        m = self.member.setdefault(seq, np.zeros(self.n_cells, dtype=bool))
        m[cells] = True
        self.refs[cells] += 1

    # -- the attention mask ---------------------------------------------------------------
    def mask(self, seqs: np.ndarray, positions: np.ndarray, n_kv: int, window: int = 0) -> np.ndarray:
        """(rows, n_kv) float32: 0 where row i (sequence seqs[i] at positions[i]) sees the cell, else -inf.
        Cells at n_cells and beyond (scratch rows) are never seen."""
        n = min(n_kv, self.n_cells)
        pos = self.pos[:n][None, :]
        p = np.asarray(positions, dtype=np.int64)[:, None]
        uses = np.stack([self.member[int(s)][:n] for s in seqs]) if len(seqs) else np.zeros((0, n), bool)
        visible = uses & (pos <= p) & (pos >= 0)
        if window:
            visible &= (p - pos) < window
        out = np.full((len(seqs), n_kv), -np.inf, dtype=np.float32)
        out[:, :n][visible] = 0
        return out
